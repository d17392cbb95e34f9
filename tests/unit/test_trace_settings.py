"""Trace settings: Triton's values checked, model overrides layered on the global ones, and the
1-in-rate / count sampling they decide."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferd.core.errors import InvalidInput, NotFound
from inferd.observability.trace_settings import TraceSettings
from inferd.workers.counts import SharedCounts


def _known(name: str) -> None:
    if name != "m":
        raise NotFound(f"unknown model '{name}'")


def test_rate_and_count_sample_the_model_own_requests() -> None:
    settings = TraceSettings(exporter=True, known_model=_known)
    assert [settings.sample("m") for _ in range(3)] == [True, True, True]
    settings.update({"trace_rate": "3", "trace_count": "2"}, model="m")
    assert [settings.sample("m") for _ in range(9)] == [False, False, True] * 2 + [False] * 3
    assert settings.get("m")["trace_count"] == "0"
    assert settings.get()["trace_count"] == "-1"  # the global scope is untouched
    assert [settings.sample("other") for _ in range(2)] == [True, True]


def test_model_overrides_inherit_and_clear() -> None:
    settings = TraceSettings(exporter=True, known_model=_known)
    settings.update({"trace_rate": "2"}, model="m")
    settings.update({"trace_level": ["OFF"]})
    assert settings.get("m")["trace_level"] == ["OFF"]  # inherited from the global change
    assert not any(settings.sample("m") for _ in range(4))
    assert settings.update({"trace_rate": None}, model="m")["trace_rate"] == "1"
    assert settings.update({"trace_level": None})["trace_level"] == ["TIMESTAMPS"]
    with pytest.raises(NotFound):
        settings.update({"trace_rate": "2"}, model="x")


def test_no_exporter_cannot_turn_tracing_on() -> None:
    settings = TraceSettings(exporter=False)
    assert settings.get()["trace_level"] == ["OFF"]
    with pytest.raises(InvalidInput, match="--trace-exporter"):
        settings.update({"trace_level": ["TIMESTAMPS"], "trace_rate": "5"})
    assert settings.get()["trace_rate"] == "1"  # nothing half applied
    assert not settings.sample("")


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"trace_level": []}, "non-empty list"),
        ({"trace_rate": ["1", "2"]}, "takes one value"),
        ({"trace_count": "-2"}, "-1 or more"),
        ({"trace_mode": "triton"}, "cannot be changed"),
        ({"log_frequency": "0", "trace_rate": True}, "string or an integer"),
    ],
)
def test_bad_values_are_refused(changes: dict[str, object], fragment: str) -> None:
    with pytest.raises(InvalidInput, match=fragment):
        TraceSettings(exporter=True).update(changes)


def test_a_limited_count_is_shared_by_the_workers(tmp_path: Path) -> None:
    # Two workers' settings over one run folder: the worker that receives the change sets the
    # count, the other applies it as received from a peer; traces taken by either count once.
    received, peer = TraceSettings(exporter=True), TraceSettings(exporter=True)
    received.counts, peer.counts = SharedCounts(tmp_path), SharedCounts(tmp_path)
    changes = {"trace_level": ["TIMESTAMPS"], "trace_rate": "1", "trace_count": "5"}
    received.update(changes, "m")
    peer.update(changes, "m", received=False)
    taken = [settings.sample("m") for _ in range(4) for settings in (received, peer)]
    assert taken == [True] * 5 + [False] * 3
    assert received.get("m")["trace_count"] == peer.get("m")["trace_count"] == "0"
    received.update({"trace_count": "2"}, "m")  # a new count, for both
    peer.update({"trace_count": "2"}, "m", received=False)
    assert peer.get("m")["trace_count"] == "2"
    assert [peer.sample("m"), received.sample("m"), peer.sample("m")] == [True, True, False]
    assert peer.sample("other") and received.sample("")  # unlimited scopes: no count
