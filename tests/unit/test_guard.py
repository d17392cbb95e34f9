"""The unload guard: ordinary deletions unload at once; a listing that loses every model, or
more than the configured share, holds them for the grace period."""

from __future__ import annotations

import pytest

from inferd.repository.guard import UnloadGuard


class Clock:
    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def _guard(max_fraction: float = 0.5, grace_s: float = 60.0) -> tuple[UnloadGuard, Clock]:
    clock = Clock()
    return UnloadGuard(max_fraction, grace_s, clock), clock


ABCD = {"a", "b", "c", "d"}


def test_losing_a_few_models_unloads_them_at_once() -> None:
    guard, _ = _guard()
    verdict = guard.review("s3://x", ABCD, {"a", "b", "c"})
    assert verdict.unload == {"d"} and not verdict.held
    verdict = guard.review("s3://x", ABCD, {"a", "b"})  # exactly half: not more than 0.5
    assert verdict.unload == {"c", "d"}
    assert guard.faults == 0 and guard.held == {}


@pytest.mark.parametrize("listed", [set(), {"a"}])
def test_losing_most_or_all_models_holds_them(listed: set[str]) -> None:
    guard, clock = _guard()
    verdict = guard.review("s3://x", ABCD, listed)
    assert verdict.held == ABCD - listed and not verdict.unload
    assert guard.faults == 1
    assert "unloading in 60 s unless it returns" in guard.held["b"].reason()
    clock.now_s += 30
    assert guard.review("s3://x", ABCD, listed).held == ABCD - listed
    assert guard.faults == 1  # one fault, however many listings it lasts
    clock.now_s += 30
    verdict = guard.review("s3://x", ABCD, listed)
    assert verdict.unload == ABCD - listed and not verdict.held
    assert guard.held == {}


def test_held_models_that_return_are_released() -> None:
    guard, clock = _guard()
    guard.review("s3://x", ABCD, set())
    clock.now_s += 10
    verdict = guard.review("s3://x", ABCD, {"a", "b"})  # some came back, the rest still held
    assert verdict.held == {"c", "d"} and not verdict.unload
    assert set(guard.held) == {"c", "d"}
    assert guard.review("s3://x", ABCD, ABCD).held == set()
    assert guard.held == {}


def test_a_single_model_lost_alone_is_held_and_an_unload_releases_it() -> None:
    guard, _ = _guard()
    assert guard.review("local", {"only"}, set()).held == {"only"}
    assert guard.release("only") and not guard.release("only")


def test_stores_are_judged_apart_and_zero_grace_unloads_at_once() -> None:
    guard, _ = _guard()
    guard.review("s3://x", {"a"}, set())
    assert guard.review("s3://y", {"b", "c", "d"}, {"b", "c"}).unload == {"d"}
    assert set(guard.held) == {"a"}
    eager, _ = _guard(grace_s=0)
    assert eager.review("s3://x", ABCD, set()).unload == ABCD


def test_a_lower_share_is_stricter() -> None:
    guard, _ = _guard(max_fraction=0.2)
    assert guard.review("s3://x", ABCD, {"a", "b", "c"}).held == {"d"}  # 25 % > 20 %
