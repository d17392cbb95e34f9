"""The speed verdict of ``inferd optimize`` (inferd.optimize.speed) and its refusal."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from inferd.optimize import speed
from inferd.optimize.data import Arrays, InputSpec, Rows
from inferd.optimize.steps import Options, Refused, measure_latency


def test_a_verdict_needs_most_rounds_and_a_margin() -> None:
    assert speed.Timing(2.0, 1.0, 10, 9).verdict == speed.FASTER
    assert speed.Timing(1.0, 2.0, 10, 1).verdict == speed.SLOWER
    assert speed.Timing(1.0, 2.0, 10, 5).verdict == speed.SAME  # the rounds disagree
    assert speed.Timing(1.0, 1.01, 10, 0).verdict == speed.SAME  # inside the 3 % margin
    assert speed.Timing(1.0, 0.5, 1, 1).verdict == speed.FASTER
    described = speed.Timing(1.0, 2.0, 25, 3).describe(32)
    assert described == "0.50x at batch 32: slower (the copy won 3 of 25 rounds)"
    timings = {1: speed.Timing(1.0, 2.0, 5, 0), 32: speed.Timing(2.0, 1.0, 5, 5)}
    assert speed.slower_at(timings) == [1]


def _fast(feed: Arrays) -> Arrays:
    return {"y": feed["x"]}


def _slow(feed: Arrays) -> Arrays:
    time.sleep(0.002)  # a hundred times the fast one's call, whatever the host's noise
    return {"y": feed["x"]}


def _options(allow_slower: bool) -> Options:
    return Options(
        model_dir=Path("."),
        int8=None,
        fp16=False,
        calibration=None,
        calibration_rows=1,
        check_rows=1,
        ranges=(),
        source_version=None,
        as_version=None,
        min_agreement=0.99,
        latency_runs=3,
        reduce_range=False,
        max_fp32_nodes=0,
        progress=False,
        report=None,
        allow_slower=allow_slower,
    )


def test_a_slower_copy_is_refused_unless_allowed() -> None:
    inputs = [InputSpec("x", np.dtype(np.float32), (-1, 1))]
    rows = Rows({"x": np.ones((4, 1), np.float32)})
    with pytest.raises(Refused) as refused:
        measure_latency(_options(False), _fast, _slow, rows, inputs, 8, "m")
    message = str(refused.value)
    assert message.startswith("model m: the optimized copy is slower than the original: ")
    assert "at batch 1: slower" in message and "at batch 8: slower" in message
    assert message.endswith("; nothing written (--allow-slower writes it anyway)")
    timings = measure_latency(_options(True), _fast, _slow, rows, inputs, 8, "m")
    assert sorted(timings) == [1, 8]
    assert all(t.verdict == speed.SLOWER and t.rounds >= 3 for t in timings.values())
    faster = measure_latency(_options(False), _slow, _fast, rows, inputs, 8, "m")
    assert all(t.verdict == speed.FASTER for t in faster.values())
