"""Whether the optimized copy is faster than the original, measured so that a noisy host cannot
decide it: both models run the same batch in interleaved rounds (original then optimized, then
the other way round), each round a block of calls lasting at least a few milliseconds. A verdict
needs most rounds to agree and the best times to differ by more than a few percent; anything
else is "within noise". ``inferd optimize`` refuses a copy that is slower at any batch size it
measured unless the operator says ``--allow-slower``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from inferd.optimize.check import Run
from inferd.optimize.data import Arrays

FASTER = "faster"
SLOWER = "slower"
SAME = "within noise"

_BLOCK_S = 0.005  # one timed block: at least this long (many calls for a small model)
_BUDGET_S = 1.0  # per batch size, rounds go on while they fit (past the minimum)
_MAX_ROUNDS = 25
_SHARE = 0.8  # a verdict needs this share of the rounds won by one side ...
_MARGIN = 0.03  # ... and the best per-call times apart by more than this fraction


@dataclass(frozen=True, slots=True)
class Timing:
    """One batch size: the best per-call time of each model and who won each round."""

    original_ms: float
    optimized_ms: float
    rounds: int
    faster_rounds: int  # rounds in which the optimized copy's block took less time

    @property
    def speedup(self) -> float:
        return self.original_ms / self.optimized_ms if self.optimized_ms > 0 else math.inf

    @property
    def verdict(self) -> str:
        if self.faster_rounds >= _SHARE * self.rounds and self.speedup > 1 + _MARGIN:
            return FASTER
        if self.faster_rounds <= (1 - _SHARE) * self.rounds and self.speedup < 1 - _MARGIN:
            return SLOWER
        return SAME

    def describe(self, batch: int) -> str:
        return (
            f"{self.speedup:.2f}x at batch {batch}: {self.verdict} (the copy won "
            f"{self.faster_rounds} of {self.rounds} rounds)"
        )


def compare(original: Run, optimized: Run, feed: Arrays, min_rounds: int) -> Timing:
    """Time both models on ``feed``: at least ``min_rounds`` rounds, more while they fit in
    about a second (up to 25), each a block of the same number of calls for both."""
    per_call = max(_once(original, feed), _once(optimized, feed), 1e-7)
    calls = max(1, math.ceil(_BLOCK_S / per_call))
    best = [math.inf, math.inf]
    rounds = wins = 0
    started = time.perf_counter()
    while rounds < _MAX_ROUNDS and (
        rounds < max(1, min_rounds) or time.perf_counter() - started < _BUDGET_S
    ):
        order = (0, 1) if rounds % 2 == 0 else (1, 0)
        took = [0.0, 0.0]
        for which in order:
            run = original if which == 0 else optimized
            began = time.perf_counter()
            for _ in range(calls):
                run(feed)
            took[which] = (time.perf_counter() - began) / calls
            best[which] = min(best[which], took[which])
        rounds += 1
        wins += took[1] < took[0]
    return Timing(best[0] * 1000.0, best[1] * 1000.0, rounds, wins)


def _once(run: Run, feed: Arrays) -> float:
    """One call, after a warmup call: the seconds it took."""
    run(feed)
    began = time.perf_counter()
    run(feed)
    return time.perf_counter() - began


def slower_at(timings: dict[int, Timing]) -> list[int]:
    """The batch sizes at which the optimized copy is slower beyond the noise."""
    return [batch for batch, timing in timings.items() if timing.verdict == SLOWER]
