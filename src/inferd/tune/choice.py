"""How ``inferd tune`` chooses, at each config's levels and then among the configs: the highest
throughput within the latency objective (p99 <= ``--latency-budget-ms``, no errors), where
throughputs within ``--tie-pct`` of the highest count as equal (a difference the measurement
cannot tell) and the lowest p99 among them wins. +0.05 % throughput never buys 4.5x the p99.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from inferd.tune.trials import Measured

TIE_PCT = 5.0  # default: about the run-to-run spread of one-second windows on a busy host

T = TypeVar("T")


def _choose(items: Sequence[T], row: Callable[[T], dict[str, Any]], tie_pct: float) -> T | None:
    """Among ``items``, those whose throughput is within ``tie_pct`` of the highest, then the
    lowest p99 of these (the higher throughput on an equal p99)."""
    if not items:
        return None
    top = max(row(item)["throughput_infer_per_s"] for item in items)
    floor = top * (1 - tie_pct / 100)
    tied = [item for item in items if row(item)["throughput_infer_per_s"] >= floor]
    return min(tied, key=lambda i: (row(i)["latency_p99_ms"], -row(i)["throughput_infer_per_s"]))


def within_objective(row: dict[str, Any], budget_ms: float | None) -> bool:
    return (
        not row["errors"]
        and row["latency_p99_ms"] is not None
        and (budget_ms is None or row["latency_p99_ms"] <= budget_ms)
    )


def pick(
    rows: list[dict[str, Any]], budget_ms: float | None, tie_pct: float = TIE_PCT
) -> dict[str, Any] | None:
    """A config's best level: within the objective, by throughput, ties by p99."""
    ok = [r for r in rows if within_objective(r, budget_ms)]
    return _choose(ok, lambda r: r, tie_pct)


def best(measured: Sequence[Measured], tie_pct: float = TIE_PCT) -> Measured | None:
    """The winning config, by the same rule over each config's best level."""
    found = [m for m in measured if m.best is not None]
    return _choose(found, lambda m: m.best or {}, tie_pct)


def describe(budget_ms: float | None, tie_pct: float) -> str:
    budget = f"p99 <= {budget_ms:g} ms" if budget_ms is not None else "no p99 budget"
    return f"{budget}; throughputs within {tie_pct:g}% count as equal, the lower p99 wins"
